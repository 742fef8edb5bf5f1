from django.urls import path

from . import views

app_name = "conversations"

urlpatterns = [
    path("conversations/", views.ConversationListView.as_view(), name="conversation-list"),
    path("conversations/<uuid:conversation_id>/", views.ConversationDetailView.as_view(), name="conversation-detail"),
    path("conversations/<uuid:conversation_id>/turns/", views.TurnListView.as_view(), name="turn-list"),
    path("conversations/<uuid:conversation_id>/turns/<uuid:turn_id>/", views.TurnDetailView.as_view(),
         name="turn-detail"),
    path("conversations/<uuid:conversation_id>/turns/<uuid:turn_id>/cancel/", views.TurnCancelView.as_view(),
         name="turn-cancel"),
]
